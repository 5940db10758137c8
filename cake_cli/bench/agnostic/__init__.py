"""The question-agnostic benchmark (`cake bench cache --parts agnostic`): `run` answers, `report` sums up."""
