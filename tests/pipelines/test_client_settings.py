"""The bundled pipelines pass `--command-config` to the source and the sink as their
`kafka.`-prefixed options (the clients they make, on the driver and the executors, take their
settings from there). The Spark objects are stand-ins that record the options given."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from onceflow.pipelines.session import PipelineOptions, add_common_arguments


class Recorder:
    """Stands for DataStreamReader/Writer: every call returns itself, options are kept."""

    def __init__(self) -> None:
        self.given: dict[str, str] = {}

    def option(self, key: str, value: str) -> Recorder:
        self.given[key] = value
        return self

    def options(self, **options: str) -> Recorder:
        self.given.update(options)
        return self

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


def parse(*argv: str) -> PipelineOptions:
    parser = argparse.ArgumentParser()
    add_common_arguments(parser, input_topic="in", output_topic="out")
    return PipelineOptions.from_args(parser.parse_args(argv))


def test_the_file_reaches_the_source_and_the_sink(tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="etl" password="pw";\n'
    )
    options = parse(
        "--bootstrap-server", "b:9092", "--checkpoint", "c", "--command-config", str(config)
    )
    expected = {
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.username": "etl",
        "kafka.sasl.password": "pw",
    }
    reader, writer = Recorder(), Recorder()

    class Spark:
        readStream = reader

    class Frame:
        writeStream = writer

    options.source(Spark())  # type: ignore[arg-type]
    options.start_sink(Frame())  # type: ignore[arg-type]
    for recorded in (reader.given, writer.given):
        assert recorded.items() >= expected.items(), recorded
        assert recorded["kafka.bootstrap.servers"] == "b:9092"


def test_without_the_file_no_client_setting_is_added() -> None:
    assert parse("--bootstrap-server", "b:9092", "--checkpoint", "c").kafka_options() == {}


def test_an_unusable_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "client.properties"
    config.write_text("not.a.setting=1\n")
    with pytest.raises(SystemExit) as exit_info:
        parse("--bootstrap-server", "b", "--checkpoint", "c", "--command-config", str(config))
    assert exit_info.value.code == 2
    assert "not.a.setting" in capsys.readouterr().err
