"""Each family's example builders, one file a family: sentence shards -> what its pretraining reads."""
