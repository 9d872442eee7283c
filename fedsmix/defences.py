"""The defences inside federated training, one home (registered in fedsmix.registry.DEFENCES)."""
