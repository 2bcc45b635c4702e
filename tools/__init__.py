"""Typed host tools and the transports that carry their commands.

Nothing here imports ``agent``: a tool is a pydantic input, the exact shell command it
sends, and a pure parser from the command's text to a pydantic output.
"""
