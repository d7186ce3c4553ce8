"""Where MirrorMaker 2's jars come from: a set of their own beside Kafka's (the registry serves
connect-mirror only up to 4.3.1, which does not run on 4.4.0's clients), cached under
<version>-mirror-maker/ with the same pom-digest stamp as Kafka's libs/."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from onceflow.apache_kafka import __main__ as cli
from onceflow.apache_kafka import distribution
from onceflow.apache_kafka.distribution import MissingTool


def fake_mirror_maker(folder: Path, digest: str | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "connect-mirror-4.3.1.jar").write_bytes(b"")
    jars = distribution.mirror_maker_jars()
    (folder / distribution.POM_STAMP).write_text(digest or distribution.pom_digest(jars.pom))
    return folder


def no_mvn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        distribution.shutil, "which", lambda name: None if name == "mvn" else f"/usr/bin/{name}"
    )


def test_the_mirror_maker_pom_pins_connect_mirror_and_its_client_as_one_release() -> None:
    jars = distribution.mirror_maker_jars()
    assert distribution.mirror_maker_version() == "4.3.1"
    root = ET.parse(jars.pom).getroot()
    artifacts = {
        d.findtext("m:artifactId", namespaces=distribution.POM_NS): d.findtext(
            "m:version", namespaces=distribution.POM_NS
        )
        for d in root.iterfind("m:dependencies/m:dependency", distribution.POM_NS)
    }
    assert artifacts["connect-mirror"] == artifacts["connect-mirror-client"] == "${kafka.version}"
    # its own folder: never mixed into Kafka's libs/ (4.3.1 beside 4.4.0 fails to load)
    assert jars.folder("4.3.1").name == "4.3.1-mirror-maker"
    assert jars.pom != distribution.pom_path()


def test_a_cached_mirror_maker_is_used_without_maven_and_a_stale_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(distribution.CACHE_ENV, str(tmp_path))
    no_mvn(monkeypatch)
    libs = fake_mirror_maker(tmp_path / "4.3.1-mirror-maker" / "libs")
    assert distribution.locate_mirror_maker().libs == libs
    assert distribution.fetch_mirror_maker() == libs
    # Kafka's own cache is not taken for MirrorMaker's, nor MirrorMaker's for Kafka's
    assert distribution.cached_libs() is None
    (libs / distribution.POM_STAMP).write_text("0" * 64)  # fetched from another pom
    with pytest.raises(MissingTool, match="mvn is not installed: it fetches MirrorMaker 2"):
        distribution.locate_mirror_maker()
    with pytest.raises(MissingTool, match=r"MirrorMaker 2 4\.3\.1 is not fetched"):
        distribution.locate_mirror_maker(allow_fetch=False)


def test_the_fetch_command_fetches_mirror_maker_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """.ci/run calls `python -m onceflow.apache_kafka fetch`: both sets come from it."""
    monkeypatch.setenv(distribution.CACHE_ENV, str(tmp_path))
    no_mvn(monkeypatch)
    version = distribution.pinned_version()
    kafka = tmp_path / version / "libs"
    kafka.mkdir(parents=True)
    (kafka / f"kafka_2.13-{version}.jar").write_bytes(b"")
    (kafka / distribution.POM_STAMP).write_text(distribution.pom_digest())
    assert cli.main(["fetch"]) == 2  # MirrorMaker's set is missing and there is no mvn
    assert "MirrorMaker 2" in capsys.readouterr().err
    fake_mirror_maker(tmp_path / "4.3.1-mirror-maker" / "libs")
    assert cli.main(["fetch"]) == 0
    out = capsys.readouterr().out
    assert f"Apache Kafka {version}" in out and "MirrorMaker 2 4.3.1" in out, out
