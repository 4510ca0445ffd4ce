"""A stand-in for NVIDIA apex with the interfaces this project uses (see ../README.md)."""
