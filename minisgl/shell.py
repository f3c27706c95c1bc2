"""python -m minisgl.shell --model <folder or Hugging Face id>: chat with a model in the
terminal (the server's workers, without HTTP)."""

from .server import launch_server

if __name__ == "__main__":
    launch_server(run_shell=True)
