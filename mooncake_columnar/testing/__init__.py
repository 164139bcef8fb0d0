"""Test support: the plain-Python reference model, servers for real-component tests."""
