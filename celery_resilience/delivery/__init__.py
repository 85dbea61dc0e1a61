"""A delivery of a ``ResilientTask``, from its admission to its end."""
