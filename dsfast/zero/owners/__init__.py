"""The state owners, one file each, composing the layers below (build.py picks one for a stage)."""
