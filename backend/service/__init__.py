"""The backend's service: the server (server.py) and the engine behind it (engine.py), built on the library."""
