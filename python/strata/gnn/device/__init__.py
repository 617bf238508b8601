"""The device data path: sampling, the feature cache and the pipeline as device kernels (GIDS, Helios)."""
