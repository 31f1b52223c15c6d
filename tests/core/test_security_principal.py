"""Certificate subjects as Kafka names them, and ssl.principal.mapping.rules.

The expected names were printed by Java 17's `X509Certificate.getSubjectX500Principal().getName()`
(what Kafka's DefaultKafkaPrincipalBuilder uses) for certificates made with openssl; the mapping
cases are Kafka's SslPrincipalMapperTest.
"""
import base64
import ssl

import pytest

from oncelog.core.security.principal import (
    ANONYMOUS,
    KafkaPrincipal,
    NoMatchingRule,
    SslPrincipalMapper,
    subject_dn_from_der,
    subject_dn_from_peercert,
)

# (certificate DER as base64, X500Principal.getName() of its subject by Java 17, getpeercert() subject)
CERTS = {
    'e1': (
        'MIICBTCCAaugAwIBAgIUbDDF+y+uxkgSjuCXVnXtZexW59cwCgYIKoZIzj0EAwIwVzELMAkGA1UEBhMCVVMxCzAJBgNVBAgM'
        'Ak1EMQ8wDQYDVQQHDAZGdWx0b24xDTALBgNVBAoMBG15Y3AxDDAKBgNVBAsMA1NNRTENMAsGA1UEAwwERHVrZTAgFw0yNjEx'
        'MjMyMjIwNDJaGA8yMTI2MTAzMDIyMjA0MlowVzELMAkGA1UEBhMCVVMxCzAJBgNVBAgMAk1EMQ8wDQYDVQQHDAZGdWx0b24x'
        'DTALBgNVBAoMBG15Y3AxDDAKBgNVBAsMA1NNRTENMAsGA1UEAwwERHVrZTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABF2P'
        'JGc1YQEUSnU4ieL0rgWn4lnGb+vh6mWdgwEgXdXJJ3KplvbzLOLlujUATe63zDsl8394JZ69J6yfn/hcW2ujUzBRMB0GA1Ud'
        'DgQWBBR6YhbsIAwUUmFCz5UfcEHs/9SHyDAfBgNVHSMEGDAWgBR6YhbsIAwUUmFCz5UfcEHs/9SHyDAPBgNVHRMBAf8EBTAD'
        'AQH/MAoGCCqGSM49BAMCA0gAMEUCIBTmHE7wJBJJUlkxG9x9ndvKBeG7SxL73kUo3L8c+nGjAiEArfpaNv0m/hneU0CwWlrR'
        'n3BK5CF22yoXHJforqiLQD4='
        , 'CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US',
        ((('countryName', 'US'),), (('stateOrProvinceName', 'MD'),), (('localityName', 'Fulton'),), (('organizationName', 'mycp'),), (('organizationalUnitName', 'SME'),), (('commonName', 'Duke'),))),
    'e2': (
        'MIICjTCCAjOgAwIBAgIUDlPnVHbg7P63HNzvPTB52Zmy4jIwCgYIKoZIzj0EAwIwgZoxEzARBgoJkiaJk/IsZAEZFgNjb20x'
        'FzAVBgoJkiaJk/IsZAEZFgdleGFtcGxlMR4wHAYDVQQKDBVTdWUsIEdyYWJiaXQgYW5kIFJ1bm4xEzARBgNVBAMMClRrYWMs'
        'IEFkYW0xHzAdBgkqhkiG9w0BCQEWEGFkYW1AZXhhbXBsZS5jb20xFDASBgoJkiaJk/IsZAEBDARhZGFtMCAXDTI2MTEyMzIy'
        'MjA0MloYDzIxMjYxMDMwMjIyMDQyWjCBmjETMBEGCgmSJomT8ixkARkWA2NvbTEXMBUGCgmSJomT8ixkARkWB2V4YW1wbGUx'
        'HjAcBgNVBAoMFVN1ZSwgR3JhYmJpdCBhbmQgUnVubjETMBEGA1UEAwwKVGthYywgQWRhbTEfMB0GCSqGSIb3DQEJARYQYWRh'
        'bUBleGFtcGxlLmNvbTEUMBIGCgmSJomT8ixkAQEMBGFkYW0wWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAATejOxCwLZJ54ra'
        'pAQf5+a8qkPnfbM7H43W/zXNMLeDW4LnP22kK6+FzFYwZ/PqfPc2vRf0osKq6pbHcFYaA220o1MwUTAdBgNVHQ4EFgQUJezH'
        'T61rjhpUxqGYIa8FUf0+844wHwYDVR0jBBgwFoAUJezHT61rjhpUxqGYIa8FUf0+844wDwYDVR0TAQH/BAUwAwEB/zAKBggq'
        'hkjOPQQDAgNIADBFAiBNEzWoaxZXDdvdkqquCMXNF4Rtqou0gP19gCxW6x08UAIhAPDrIgXofK2JnY9zAXgogkrlwhdAAoEE'
        'NR+/z9Lu1hlw'
        , 'UID=adam,1.2.840.113549.1.9.1=#16106164616d406578616d706c652e636f6d,CN=Tkac\\, Adam,O=Sue\\, Grabbit and Runn,DC=example,DC=com',
        ((('domainComponent', 'com'),), (('domainComponent', 'example'),), (('organizationName', 'Sue, Grabbit and Runn'),), (('commonName', 'Tkac, Adam'),), (('emailAddress', 'adam@example.com'),), (('userId', 'adam'),))),
    'e3': (
        'MIICUTCCAfegAwIBAgIUHiZinrZ8hT/5j8RHJDV5NtsgqjIwCgYIKoZIzj0EAwIwfTEMMAoGA1UECgwDT3JnMS0wCwYDVQQL'
        'DAR1bml0MAwGA1UEAwwFbXVsdGkwEAYKCZImiZPyLGQBAQwCdTExDTALBgNVBAUTBDEyMzQxDTALBgNVBAwMBGJvc3MxEDAO'
        'BgNVBAkMB01haW4gU3QxDjAMBgNVBBEMBTEyMzQ1MCAXDTI2MTEyMzIyMjA0MloYDzIxMjYxMDMwMjIyMDQyWjB9MQwwCgYD'
        'VQQKDANPcmcxLTALBgNVBAsMBHVuaXQwDAYDVQQDDAVtdWx0aTAQBgoJkiaJk/IsZAEBDAJ1MTENMAsGA1UEBRMEMTIzNDEN'
        'MAsGA1UEDAwEYm9zczEQMA4GA1UECQwHTWFpbiBTdDEOMAwGA1UEEQwFMTIzNDUwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNC'
        'AASJkdzknk9QLmrzgUMvJ2tuLqouC4Fe1sLjTm19a5zZC9Thcv1UM/r1mF7UlpX/d8fCXKUMqCUpXL6wMKV7M8Lco1MwUTAd'
        'BgNVHQ4EFgQUk1q91FOofcSqeslcorQoMZOBT1IwHwYDVR0jBBgwFoAUk1q91FOofcSqeslcorQoMZOBT1IwDwYDVR0TAQH/'
        'BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiEAqSpVNF+IU6SopXuInSWKn1MAnOeJ7by5Xo/oswlyqgECICGscROhL4IRPuWe'
        'pNpuqEsil76+tgADhcRmNndfaIXZ'
        , '2.5.4.17=#0c053132333435,STREET=Main St,2.5.4.12=#0c04626f7373,2.5.4.5=#130431323334,OU=unit+CN=multi+UID=u1,O=Org',
        ((('organizationName', 'Org'),), (('organizationalUnitName', 'unit'), ('commonName', 'multi'), ('userId', 'u1')), (('serialNumber', '1234'),), (('title', 'boss'),), (('streetAddress', 'Main St'),), (('postalCode', '12345'),))),
    'e4': (
        'MIIB2TCCAX+gAwIBAgIUCIosqMxTNoQz0paiPCiF0BpqHFowCgYIKoZIzj0EAwIwQTEZMBcGA1UEAwwQIGxlYWQgYW5kIHRy'
        'YWlsIDEUMBIGA1UECgwLw5xuw69jw7hkw6kxDjAMBgNVBAsMBSNoYXNoMCAXDTI2MTEyMzIyMjA0MloYDzIxMjYxMDMwMjIy'
        'MDQyWjBBMRkwFwYDVQQDDBAgbGVhZCBhbmQgdHJhaWwgMRQwEgYDVQQKDAvDnG7Dr2PDuGTDqTEOMAwGA1UECwwFI2hhc2gw'
        'WTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAASERE01rvu5lagsZC/Ue29E59DY47Hv7V3w4UbnvbAEd2GoHcHXYMKdiPL6IVKo'
        'Y+4Lr7rwRj74YUxlx2aPovfXo1MwUTAdBgNVHQ4EFgQUwyzJsL9Zw0qIL5Z0NjPkg5Dm+HYwHwYDVR0jBBgwFoAUwyzJsL9Z'
        'w0qIL5Z0NjPkg5Dm+HYwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiEAxbwlbC4/VF6wp/bz3XTDtuU8ehP8'
        '1jaIsa2XBlxHdOECIBlZUT5tXSV/d9X2MbyroCg63V2cs9/Pl6ZeYI+M+EiX'
        , 'OU=\\#hash,O=Ünïcødé,CN=\\ lead and trail\\ ',
        ((('commonName', ' lead and trail '),), (('organizationName', 'Ünïcødé'),), (('organizationalUnitName', '#hash'),))),
    'e5': (
        'MIIBzzCCAXWgAwIBAgIUbkuFmCm3agDlYgnYch679dPJrdcwCgYIKoZIzj0EAwIwPDEeMBwGA1UEAwwVYT1iK2M7ZDxlPmYi'
        'Z1xoLGkgI2ogMQswCQYDVQQLDAIgeDENMAsGA1UECgwEdGVzdDAgFw0yNjExMjMyMjIwNDJaGA8yMTI2MTAzMDIyMjA0Mlow'
        'PDEeMBwGA1UEAwwVYT1iK2M7ZDxlPmYiZ1xoLGkgI2ogMQswCQYDVQQLDAIgeDENMAsGA1UECgwEdGVzdDBZMBMGByqGSM49'
        'AgEGCCqGSM49AwEHA0IABPKZAJqS7buTGqY2HvRengYVKSRN6hCKx9Er8EGE7AhPzZr7oRBjSQgNpslpWA0jl2oe8QJ3qXGV'
        'lwnJ2iqToH+jUzBRMB0GA1UdDgQWBBTeeHB6pBYEyBYRvi4tWSBvK543aTAfBgNVHSMEGDAWgBTeeHB6pBYEyBYRvi4tWSBv'
        'K543aTAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCICF1T9QgCZIt/MerpmK/bt0tPRUKav94NhhUVgE1XQHt'
        'AiEAyiFVU/eU0lr4Wu/2+Pk3WLRpjCkG4sfB1Jq1VNYbE18='
        , 'O=test,OU=\\ x,CN=a\\=b\\+c\\;d\\<e\\>f\\"g\\\\h\\,i \\#j\\ ',
        ((('commonName', 'a=b+c;d<e>f"g\\h,i #j '),), (('organizationalUnitName', ' x'),), (('organizationName', 'test'),))),
    'e6': (
        'MIIBzjCCAXUCFCXBL+0LL7uWYhlhz6yv1eTqPRwqMAoGCCqGSM49BAMCMGkxCzAJBgNVBAYTAkRFMRUwEwYDVQQKHgwAQgDk'
        'AGMAawBlAHIxDjAMBgNVBAMTBXBsYWluMR0wGwYDVQQMHhQA3ABiAGUAcgBtAGUAbgBzAGMAaDEUMBIGCSqGSIb3DQEJARYF'
        'eEB5LnowIBcNMjYxMTIzMjIyMDQyWhgPMjEyNjEwMzAyMjIwNDJaMGkxCzAJBgNVBAYTAkRFMRUwEwYDVQQKHgwAQgDkAGMA'
        'awBlAHIxDjAMBgNVBAMTBXBsYWluMR0wGwYDVQQMHhQA3ABiAGUAcgBtAGUAbgBzAGMAaDEUMBIGCSqGSIb3DQEJARYFeEB5'
        'LnowWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAReSMY0s+o8LsLDoiwznQRw56VVJxF+Aa6qk8ZnCgUw7TjPKWLYXiu8rrMC'
        'NonBXHUzM1XzksrTh7vwODkLwcciMAoGCCqGSM49BAMCA0cAMEQCIHJ4PdSx/q/uGHnSwRi/VhKFX0E3FkC+rJzTFTJIw3Hi'
        'AiBhY/Euc3yrKSo585nCEipc44258eiuo4YeOSymXH/qgw=='
        , '1.2.840.113549.1.9.1=#16057840792e7a,2.5.4.12=#1e1400dc006200650072006d0065006e007300630068,CN=plain,O=\\00B\\00�\\00c\\00k\\00e\\00r,C=DE',
        ((('countryName', 'DE'),), (('organizationName', 'Bäcker'),), (('commonName', 'plain'),), (('title', 'Übermensch'),), (('emailAddress', 'x@y.z'),))),
}


@pytest.mark.parametrize("name", sorted(CERTS))
def test_subject_from_der_is_what_java_prints(name):
    der_b64, java_name, _ = CERTS[name]
    assert subject_dn_from_der(base64.b64decode(der_b64)) == java_name


@pytest.mark.parametrize("name", ["e1", "e2", "e3", "e4", "e5"])
def test_subject_from_getpeercert_tuples_matches_java_for_usual_string_types(name):
    _, java_name, subject = CERTS[name]
    assert subject_dn_from_peercert(subject) == java_name


def test_peercert_tuples_cannot_see_a_bmpstring_but_der_can():
    # e6 stores O and title as BMPString; the JDK decodes those bytes as UTF-8 (\00B\00...) and
    # prints title as #hex of a BMPString. The decoded tuples have lost that; the DER has not.
    der_b64, java_name, subject = CERTS["e6"]
    assert subject_dn_from_der(base64.b64decode(der_b64)) == java_name
    assert subject_dn_from_peercert(subject) != java_name


def test_stdlib_decoding_gives_the_tuples_used_above(tmp_path):
    decode = getattr(ssl._ssl, "_test_decode_cert", None)
    if decode is None:
        pytest.skip("this Python has no ssl._ssl._test_decode_cert to decode a certificate file")
    for name, (der_b64, _, subject) in CERTS.items():
        path = tmp_path / f"{name}.pem"
        path.write_text(ssl.DER_cert_to_PEM_cert(base64.b64decode(der_b64)))
        assert decode(str(path))["subject"] == subject


def test_unknown_attribute_name_in_tuples_is_refused():
    with pytest.raises(ValueError):
        subject_dn_from_peercert(((("frobnicator", "x"),),))
    # a dotted OID (what getpeercert gives for attributes OpenSSL has no name for) is fine
    assert subject_dn_from_peercert(((("1.2.3.4", "x"),),)) == "1.2.3.4=#0c0178"


@pytest.mark.parametrize("junk", [b"", b"\x30", b"\x30\x05\x30\x03\x02\x01", b"\x31\x00", b"\x30\x84\xff\xff\xff\xff"])
def test_malformed_der_raises_value_error(junk):
    with pytest.raises(ValueError):
        subject_dn_from_der(junk)


def test_principal_text_form():
    assert str(KafkaPrincipal.user("alice")) == "User:alice"
    assert str(ANONYMOUS) == "User:ANONYMOUS"
    assert KafkaPrincipal.parse("User:CN=a:b,O=c") == KafkaPrincipal("User", "CN=a:b,O=c")
    for bad in ("", "alice"):
        with pytest.raises(ValueError):
            KafkaPrincipal.parse(bad)


# ------------------------------------------------------------------ SslPrincipalMapperTest

@pytest.mark.parametrize("rules", [
    "DEFAULT",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
    "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
    "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
    "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
])
def test_valid_rules(rules):
    SslPrincipalMapper.from_rules(rules)


@pytest.mark.parametrize("rules", [
    "default", "DEFAUL", "DEFAULT/L", "DEFAULT/U",
    "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
    "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
])
def test_invalid_rules(rules):
    with pytest.raises(ValueError):
        SslPrincipalMapper.from_rules(rules)


def test_mapping():
    mapper = SslPrincipalMapper.from_rules(", ".join([
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT"]))
    assert mapper.name_for("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name_for("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name_for("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name_for("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert mapper.name_for("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"


@pytest.mark.parametrize("expected, rules", [
    ("[]", ""),
    ("[DEFAULT]", "DEFAULT"),
    ("[RULE:/]", "RULE://"),
    ("[RULE:/.*]", "RULE:/.*/"),
    ("[RULE:/.*/L]", "RULE:/.*/L"),
    ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
    ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
    ("[RULE:   /     , DEFAULT]", "  RULE:   /     / ,  DEFAULT  "),
    ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
    ("[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]", "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  "),
    ("[]", ",   , , ,      , , ,   "),
    ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
    ("[RULE: /   , DEFAULT]", ",  , RULE: /   /    ,,,   DEFAULT, ,   "),
    ("[RULE:   /  /U, DEFAULT]", "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,"),
    ("[RULE:\\/\\\\\\(\\)\\n\\t/\\/\\/]", "RULE:\\/\\\\\\(\\)\\n\\t/\\/\\//"),
    ("[RULE:\\**\\/+/*/L, RULE:\\/*\\**/**]", "RULE:\\**\\/+/*/L,RULE:\\/*\\**/**/"),
    ("[RULE:,RULE:,/,RULE:,\\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]",
     "RULE:,RULE:,/,RULE:,\\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT"),
])
def test_rules_splitting(expected, rules):
    assert str(SslPrincipalMapper.from_rules(rules)) == f"SslPrincipalMapper(rules = {expected})"


def test_comma_with_whitespace():
    mapper = SslPrincipalMapper.from_rules("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name_for("CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz") == "Tkac\\, Adam"


def test_no_rule_matching_fails_and_empty_rules_match_nothing():
    with pytest.raises(NoMatchingRule):
        SslPrincipalMapper.from_rules("RULE:^CN=x$/y/").name_for("CN=z")
    with pytest.raises(NoMatchingRule):
        SslPrincipalMapper.from_rules("").name_for("CN=z")
    assert SslPrincipalMapper.from_rules(None).name_for("CN=z") == "CN=z"


def test_java_replacement_syntax():
    # $12 with one group is group 1 then "2" (Java's appendReplacement), a reference beyond the
    # groups is literal text (Kafka's escapeLiteralBackReferences), \$ is a literal dollar
    assert SslPrincipalMapper.from_rules("RULE:^CN=(\\w+)$/$12/").name_for("CN=ab") == "ab2"
    assert SslPrincipalMapper.from_rules("RULE:^CN=(\\w+)$/$1@$4/").name_for("CN=ab") == "ab@$4"
    assert SslPrincipalMapper.from_rules("RULE:^CN=(\\w+)$/\\$$1/").name_for("CN=ab") == "$ab"
    assert SslPrincipalMapper.from_rules("RULE:^CN=(?<who>\\w+)$/${who}!/").name_for("CN=ab") == "ab!"
