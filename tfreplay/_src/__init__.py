"""The core every buffer is made of: specs, ring, episode index, storage, samplers, twins."""
