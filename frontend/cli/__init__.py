"""The `tinyvllm` command: main.py parses it and runs each verb."""
