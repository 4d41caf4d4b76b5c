"""Stateful (hypothesis) property tests of the product model and the runtime machines."""
