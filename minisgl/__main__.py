"""python -m minisgl --model <folder or Hugging Face id>: the server (--help for its flags)."""

from .server import launch_server

if __name__ == "__main__":
    launch_server()
