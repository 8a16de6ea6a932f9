"""Every benchmark and its report writer (docs/architecture.md): the CLI's `bench` commands and `study
fleet`. Imported by the CLI only; nothing in the serving path imports a benchmark."""
