"""The sidecar as a one-folder bundle a game ships: no Python, compiler or network needed.

Light on purpose: the bundle's entry point imports this package before llama.cpp is loaded.
"""
