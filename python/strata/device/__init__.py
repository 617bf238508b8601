"""What the device paths share: the torch twins of Strata's Rust primitives (``rng``), kept
bit for bit equal to them so a GPU kernel and the Rust engine agree on every random choice."""
