"""The sandbox adapter. Only ``tether.sandbox.monty`` imports pydantic_monty."""
