"""A simulated SGLang fleet: many engines in one process, one loopback port each (benchmarks and scale tests).

Sixty-four CPU torch engines do not fit on a 2-core machine; sixty-four of these do. Each speaks the
lifecycle endpoints of SGLang 0.5.23 with the request and response models of :mod:`engines.protocol`
(what ``../shared/contracts/`` describes), keeps the state a real server would (weight version, released
memory, paused generation) and answers each endpoint after a configurable latency, so a fleet operation's
cost is measurable. It generates no real text: answers are deterministic letters, tokenized with the
served checkpoint's own tokenizer so the rollout side's prompt check holds. The real CPU engine stays the
default everywhere else.
"""
