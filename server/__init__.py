"""Server side: the ServerApp, upload validation and storage, results, and the adversary."""
