"""Deployment: compose services run natively (smoke), certificates, SuperNode registration."""
