"""Where Apache Kafka's jars come from: the pinned pom, a distribution's libs/, the cache, and
an error naming what is missing (never a silent skip)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from onceflow.apache_kafka import distribution
from onceflow.apache_kafka.distribution import MissingTool


def fake_libs(folder: Path, version: str = "9.9.9", pom_digest: str | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / f"kafka_2.13-{version}.jar").write_bytes(b"")
    (folder / distribution.POM_STAMP).write_text(pom_digest or distribution.pom_digest())
    return folder


def test_the_pom_pins_a_kafka_4_release_of_the_broker_tools_and_storage() -> None:
    version = distribution.pinned_version()
    assert version.split(".")[0] == "4", version
    root = ET.parse(distribution.pom_path()).getroot()
    artifacts = {
        d.findtext("m:artifactId", namespaces=distribution.POM_NS)
        for d in root.iterfind("m:dependencies/m:dependency", distribution.POM_NS)
    }
    assert {
        "kafka_2.13",
        "kafka-tools",
        "kafka-storage",
        "kafka-streams",
        "log4j-core",
    } <= artifacts


def test_a_distribution_directory_or_its_libs_folder_is_accepted(tmp_path: Path) -> None:
    libs = fake_libs(tmp_path / "kafka_2.13-9.9.9" / "libs")
    assert distribution.libs_of(libs.parent) == libs
    assert distribution.libs_of(libs) == libs
    assert distribution.Distribution(libs).version == "9.9.9"
    with pytest.raises(ValueError, match="neither Apache Kafka's libs"):
        distribution.libs_of(tmp_path)


def test_a_cached_fetch_is_used_without_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(distribution.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(distribution.LIBS_ENV, raising=False)
    libs = fake_libs(tmp_path / distribution.pinned_version() / "libs")
    monkeypatch.setattr(
        distribution.shutil, "which", lambda name: None if name == "mvn" else f"/usr/bin/{name}"
    )
    assert distribution.fetch() == libs
    assert distribution.locate().libs == libs


def test_a_fetch_from_another_pom_is_fetched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache filled before the pom gained an artifact lacks its jars: it is not used."""
    monkeypatch.setenv(distribution.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(distribution.LIBS_ENV, raising=False)
    fake_libs(tmp_path / distribution.pinned_version() / "libs", pom_digest="0" * 64)
    assert distribution.cached_libs() is None
    monkeypatch.setattr(
        distribution.shutil, "which", lambda name: None if name == "mvn" else f"/usr/bin/{name}"
    )
    with pytest.raises(MissingTool, match="mvn is not installed"):
        distribution.locate()


def test_without_mvn_the_error_names_mvn_and_the_way_around_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(distribution.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(distribution.LIBS_ENV, raising=False)
    monkeypatch.setattr(
        distribution.shutil, "which", lambda name: None if name == "mvn" else f"/usr/bin/{name}"
    )
    with pytest.raises(MissingTool, match=r"mvn is not installed.*ONCEFLOW_APACHE_KAFKA"):
        distribution.locate()


def test_without_java_the_error_names_java(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distribution.shutil, "which", lambda name: None)
    with pytest.raises(MissingTool, match="java is not installed"):
        distribution.locate()


def test_the_env_var_points_at_a_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libs = fake_libs(tmp_path / "dist" / "libs")
    monkeypatch.setenv(distribution.LIBS_ENV, str(libs.parent))
    monkeypatch.setattr(distribution.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert distribution.locate().libs == libs


def test_the_skip_names_what_is_missing_and_ci_fails_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.apache_kafka import fixtures

    monkeypatch.setattr(distribution.shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="java is not installed"):
        fixtures.require_apache_kafka()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the Apache Kafka tests"):
        fixtures.require_apache_kafka()
