"""pytest plugin placeholder: the regression harness lands here."""
