"""mini-sglang, rebuilt chapter by chapter in "mini-sglang from Scratch"."""
