"""The figures of the chapters' pages, one module per chapter (chNN.py)."""
