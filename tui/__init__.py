"""The Textual dashboard over many models (issue 7)."""
