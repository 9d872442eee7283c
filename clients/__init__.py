"""Party side: Flower ClientApp handlers (thin wrappers around the fedsmix library)."""
