"""What a port writes and says: the converted checkpoint (``weights``), PORT.md and the text
summary (``render``), the linter's reading of the output (``lint``) and how vLLM serves it
(``served``)."""
