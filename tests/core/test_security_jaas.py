"""sasl.jaas.config values, read as Kafka reads them (cases from Kafka's JaasContextTest)."""
import pytest

from oncelog.core.security.jaas import (
    PLAIN_LOGIN_MODULE,
    SCRAM_LOGIN_MODULE,
    JaasConfigError,
    LoginModuleEntry,
    client_credentials,
    parse_jaas_config,
    parse_sasl_jaas_config,
    plain_users,
)


@pytest.mark.parametrize("flag", ["required", "requisite", "sufficient", "optional", "REQUIRED"])
def test_control_flags(flag):
    [entry] = parse_jaas_config(f"test.testControlFlag {flag} propName=propValue;")
    assert entry == LoginModuleEntry("test.testControlFlag", flag.upper(), {"propName": "propValue"})


def test_options():
    [e] = parse_jaas_config("test.testConfigNoOptions required;")
    assert e.options == {}
    many = " ".join(f"propName{i}=propValue{i}" for i in range(10))
    [e] = parse_jaas_config(f"test.testMultipleOptions sufficient {many};")
    assert e.options == {f"propName{i}": f"propValue{i}" for i in range(10)}


def test_quoted_values_and_names():
    [e] = parse_jaas_config('test.q required propName="prop value" propName2="value1 = 1, value2 = 2";')
    assert e.options == {"propName": "prop value", "propName2": "value1 = 1, value2 = 2"}
    [e] = parse_jaas_config('test.q required "prop name"=propValue;')
    assert e.options == {"prop name": "propValue"}
    [e] = parse_jaas_config("test.q required option1=\"3\" option2='single' esc=\"a\\\"b\\\\c\\tq\";")
    assert e.options == {"option1": "3", "option2": "single", "esc": 'a"b\\c\tq'}


def test_multiple_modules_and_comments():
    entries = parse_jaas_config("""
        // a comment
        test.Module0 required index=Index0 module=Module0;
        /* another */ test.Module1 required index=Index1 module=Module1; test.Module2 optional;
    """)
    assert [e.login_module for e in entries] == ["test.Module0", "test.Module1", "test.Module2"]
    with pytest.raises(JaasConfigError, match="should be 1 module"):
        parse_sasl_jaas_config("a required; b required;")


@pytest.mark.parametrize("text", [
    "  required option1=value1;",                       # missing login module: "required" is taken as it
    "test.loginModule option1=value1;",                 # missing control flag
    "loginModule required option1;",                    # missing option value
    "test.testMissingSemicolon required option1=value1",
    "test.testNumericOptionWithoutQuotes required option1=3;",
    "test.testInvalidControlFlag { option1=3;",
    "",
    "// only a comment",
])
def test_invalid_configs(text):
    with pytest.raises(JaasConfigError):
        parse_jaas_config(text)


def test_plain_users_come_only_from_the_plain_login_module():
    text = (f'{PLAIN_LOGIN_MODULE} required username="admin" password="admin-secret" '
            'user_admin="admin-secret" user_alice="alice-secret" user_="empty";')
    entry = parse_sasl_jaas_config(text)
    assert plain_users(entry) == {"admin": "admin-secret", "alice": "alice-secret", "": "empty"}
    assert client_credentials(entry) == ("admin", "admin-secret")
    other = parse_sasl_jaas_config('com.example.Other required user_bob="x";')
    assert plain_users(other) == {}
    with pytest.raises(JaasConfigError):
        client_credentials(other)
    scram = parse_sasl_jaas_config(f'{SCRAM_LOGIN_MODULE} required username="broker" password="pw";')
    assert client_credentials(scram) == ("broker", "pw")
    with pytest.raises(JaasConfigError):
        client_credentials(parse_sasl_jaas_config(f"{SCRAM_LOGIN_MODULE} required;"))
