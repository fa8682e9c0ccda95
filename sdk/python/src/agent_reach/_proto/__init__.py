"""Stubs generated from proto/ by gen_protos.py; do not edit."""
