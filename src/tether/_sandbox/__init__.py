"""The sandbox adapter. Only ``tether._sandbox.monty`` imports pydantic_monty."""
