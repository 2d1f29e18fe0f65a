"""The deployment's settings from PHOTON_SETTINGS: a bad value is one line naming the setting."""

import pytest

from resources.settings import SETTINGS_ENV, pipeline_settings


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(SETTINGS_ENV, '{"query_cache_vacuum_retain_hours": 24}')
    assert pipeline_settings().query_cache_vacuum_retain_hours == 24
    monkeypatch.delenv(SETTINGS_ENV)
    assert pipeline_settings().query_cache_vacuum_retain_hours == 1


def test_a_fraction_of_an_hour_to_retain_files_is_one_line_naming_the_setting(monkeypatch):
    # Delta's VACUUM rounds its hours: 0.25 would delete removed files at once.
    monkeypatch.setenv(SETTINGS_ENV, '{"query_cache_vacuum_retain_hours": 0.25}')
    with pytest.raises(ValueError) as raised:
        pipeline_settings()
    assert "\n" not in str(raised.value)
    assert str(raised.value).startswith(f"{SETTINGS_ENV}: query_cache_vacuum_retain_hours: ")
    assert "(got 0.25)" in str(raised.value)
