"""python -m gqa: print the configuration."""
from . import show_config

if __name__ == "__main__":
    show_config()
