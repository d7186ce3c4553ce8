"""API handlers, one module per family of APIs; broker/dispatch.py lists them in its table."""
