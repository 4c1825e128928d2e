"""What a check is and what it returns (``rule.Rule``, ``rule.Finding``): the base the
config rules (``analyzer/rules``) and the static remote-code checks (``analyzer/remote/checks``)
both stand on."""
