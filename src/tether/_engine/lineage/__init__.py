"""The lineage of a write's arguments: where each value came from, and whether a person must see it (D-63).

Each module is imported from the file that defines it: ``values`` (what can be matched later in a value),
``flow`` (the static data-flow pass over a program), ``roles`` (destination vs content arguments),
``judge`` (the pure decision).
"""
