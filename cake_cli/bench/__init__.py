"""Benchmarks: speed and memory (`speed/`), answer quality (`quality/`, with `needles`, `datasets`,
`splits`, `suites`, `scoring`), tau search (`tau_search`), saved-cache reuse (`reuse`), and the
real text and memory sampling they share (`corpus`, `memory`)."""
