"""What the `onceflow` tools share below the command line: their errors, their output, the
clients they connect with and the parsing of option values. The commands (cli/), the
benchmarks (bench/) and the pipelines use them; nothing here imports the command line."""
