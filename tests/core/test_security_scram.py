"""SCRAM-SHA-256/512 and PLAIN, server side: RFC test vectors, real client implementations as
oracles (kafka-python's and aiokafka's SCRAM clients), and every way an exchange must fail."""
import base64
import itertools
import types

import pytest

from oncelog.core.security import plain, scram
from oncelog.core.security.sasl import AuthenticationFailed, IllegalSaslState
from oncelog.core.security.scram import (
    AddScramError,
    ScramClient,
    ScramMechanism,
    ScramServer,
    ScramState,
    credential_from_password,
    credential_from_salted_password,
    parse_add_scram,
    salted_password,
    split_add_scram_list,
)

# kafka-python reads its schemas with importlib.resources' legacy calls
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated. Use files:DeprecationWarning")

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
# RFC 5802 §5 uses SCRAM-SHA-1, which Kafka does not offer; the machinery takes any hash
SHA1 = types.SimpleNamespace(hash_name="sha1", mechanism_name="SCRAM-SHA-1", type=0)


def counter_bytes():
    c = itertools.count()
    return lambda n: bytes((next(c) + i) % 256 for i in range(n))


def server(mech, creds, **kw):
    return ScramServer(mech, creds.get, counter_bytes(), b"per-broker-secret", **kw)


# ------------------------------------------------------------------ RFC vectors

def test_rfc5802_sha1_example():
    cred = credential_from_password(SHA1, "pencil", base64.b64decode("QSXCR+Q6sek8bf92"), 4096)
    s = server(SHA1, {"user": cred}, server_nonce="3rfcNHYJY1ZVvWVs7j")
    assert s.evaluate(b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL") == \
        b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096"
    assert s.evaluate(b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=") == \
        b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ="
    assert s.complete and s.authorization_id == "user"


def test_rfc7677_sha256_example():
    cred = credential_from_password(SHA256, "pencil", base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="), 4096)
    s = server(SHA256, {"user": cred}, server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert s.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == \
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert s.evaluate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                      b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=") == \
        b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert s.complete


def test_rfc_client_side_vectors():
    c = ScramClient(SHA1, "user", "pencil", counter_bytes(), client_nonce="fyko+d2lbbFgONRv9qkxdawL")
    assert c.first_message() == b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL"
    assert c.final_message(b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096") == \
        b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
    c.verify_server_final(b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=")


def test_kafka_scram_parser_test_vector():
    # Kafka's ScramParserTest: a known salt and salted password become this record
    salt = bytes([49, 108, 118, 52, 112, 100, 110, 119, 52, 102, 119, 113, 55, 110, 111, 116, 99, 120, 109, 48,
                  121, 121, 49, 107, 55, 113])
    salted = base64.b64decode("mT0yyUUxnlJaC99HXgRTSYlbuqa4FSGtJCJfTMvjYCE=")
    got = parse_add_scram('SCRAM-SHA-256=[name=alice,salt="MWx2NHBkbnc0ZndxN25vdGN4bTB5eTFrN3E=",'
                          'saltedpassword="mT0yyUUxnlJaC99HXgRTSYlbuqa4FSGtJCJfTMvjYCE="]', counter_bytes())
    assert got.name == "alice" and got.mechanism is SHA256
    assert got.credential == credential_from_salted_password(SHA256, salt, salted, 4096)


# ------------------------------------------------------------------ real clients as oracles

def _run_kafka_python(mech, user, password, cred):
    from kafka.net.sasl.scram import ScramClient as KafkaPythonScram
    client = KafkaPythonScram(user, password, mech.mechanism_name)
    s = server(mech, {user: cred})
    client.process_server_first_message(s.evaluate(client.first_message()))
    client.process_server_final_message(s.evaluate(client.final_message()))   # raises on a wrong signature
    return s


def _run_aiokafka(mech, user, password, cred):
    from aiokafka.conn import ScramAuthenticator
    auth = ScramAuthenticator(loop=None, sasl_plain_username=user, sasl_plain_password=password,
                              sasl_mechanism=mech.mechanism_name)
    s = server(mech, {user: cred})
    steps = auth.authenticator_scram()
    token, _ = next(steps)
    token, _ = steps.send(s.evaluate(token))
    with pytest.raises(StopIteration):
        steps.send(s.evaluate(token))
    return s


@pytest.mark.parametrize("mech", [SHA256, SHA512])
@pytest.mark.parametrize("run", [_run_kafka_python, _run_aiokafka], ids=["kafka-python", "aiokafka"])
@pytest.mark.parametrize("iterations", [4096, 16384])
def test_real_clients_authenticate(mech, run, iterations):
    cred = credential_from_password(mech, "alice-secret", b"0123456789abcdef", iterations)
    s = run(mech, "alice", "alice-secret", cred)
    assert s.complete and s.authorization_id == "alice"


@pytest.mark.parametrize("mech", [SHA256, SHA512])
def test_real_clients_with_wrong_password_fail(mech):
    cred = credential_from_password(mech, "alice-secret", b"0123456789abcdef", 4096)
    for run in (_run_kafka_python, _run_aiokafka):
        with pytest.raises(AuthenticationFailed, match="Invalid client credentials") as e:
            run(mech, "alice", "wrong", cred)
        assert e.value.client_message is None and e.value.user == "alice"


def test_aiokafka_escapes_names_and_we_unescape_them():
    cred = credential_from_password(SHA256, "pw", b"salt-salt-salt", 4096)
    s = _run_aiokafka(SHA256, "a=b,c", "pw", cred)
    assert s.authorization_id == "a=b,c"


@pytest.mark.parametrize("mech", [SHA256, SHA512])
def test_own_client_round_trip_and_server_signature_check(mech):
    cred = credential_from_password(mech, "pw", b"s" * 16, 8192)
    s = server(mech, {"bob": cred})
    c = ScramClient(mech, "bob", "pw", counter_bytes())
    final = c.final_message(s.evaluate(c.first_message()))
    server_final = s.evaluate(final)
    c.verify_server_final(server_final)
    with pytest.raises(scram.ScramClientError):
        c.verify_server_final(b"v=" + base64.b64encode(b"x" * mech.digest_size))


# ------------------------------------------------------------------ failures

def _client_first_and_server(mech=SHA256, user="alice", password="secret"):
    cred = credential_from_password(mech, password, b"0123456789abcdef", 4096)
    s = server(mech, {"alice": cred})
    c = ScramClient(mech, user, password, counter_bytes())
    return s, c, s.evaluate(c.first_message())


@pytest.mark.parametrize("forge", [
    lambda client, full: client,                 # only the client's part
    lambda client, full: full[len(client):],     # only the server's part
    lambda client, full: "x" + full,             # the full nonce as a suffix (Kafka < 3.7.2 took it)
    lambda client, full: full + "x",
    lambda client, full: full[:-1],
])
def test_full_nonce_is_required_cve_2024_56128(forge):
    s, c, server_first = _client_first_and_server()
    client_nonce = c.first_message().decode().split(",r=", 1)[1]
    full = server_first.decode().split(",")[0][2:]
    final = c.final_message(server_first).decode()
    forged = final.replace(f",r={full},", f",r={forge(client_nonce, full)},")
    assert forged != final
    with pytest.raises(AuthenticationFailed, match="nonce"):
        s.evaluate(forged.encode())
    assert s.state is ScramState.FAILED


def test_unknown_user_gets_a_challenge_and_fails_at_the_proof():
    s = server(SHA256, {})
    c = ScramClient(SHA256, "nobody", "pw", counter_bytes())
    first = s.evaluate(c.first_message())
    assert first.startswith(b"r=") and b",s=" in first and first.endswith(b",i=4096")
    # the same name gets the same salt each time, as a real user would
    s_again = server(SHA256, {})
    assert s_again.evaluate(ScramClient(SHA256, "nobody", "pw", counter_bytes()).first_message()).split(b",")[1] \
        == first.split(b",")[1]
    with pytest.raises(AuthenticationFailed) as e:
        s.evaluate(c.final_message(first))
    assert e.value.client_message is None        # the generic text: nothing says the user is unknown


@pytest.mark.parametrize("token", [
    b"", b"garbage", b"y,,n=alice,r=abc", b"p=tls-unique,,n=alice,r=abc", b"n,,n=alice", b"n,,r=abc,n=alice",
    b"n,,n=al=ce,r=abc", b"n,,n=alice,r=a,b", b"n,,n=\xc3\xa9,r=abc", b"\xff\xfe", b"n,,m=ext,n=alice,r=abc",
    b"n,,n=,r=abc",
])
def test_malformed_client_first(token):
    s = server(SHA256, {"alice": credential_from_password(SHA256, "pw", b"s" * 16)})
    with pytest.raises(AuthenticationFailed) as e:
        s.evaluate(token)
    assert e.value.client_message is None and s.state is ScramState.FAILED


def test_malformed_client_final():
    for mutate in (lambda f: b"", lambda f: f.replace(b"c=biws", b"c=b!ws"),
                   lambda f: f.split(b",p=")[0], lambda f: f + b"=",
                   lambda f: f.split(b",p=")[0] + b",p=" + base64.b64encode(b"short")):
        s, c, server_first = _client_first_and_server()
        with pytest.raises(AuthenticationFailed):
            s.evaluate(mutate(c.final_message(server_first)))
        assert s.state is ScramState.FAILED


def test_authzid_must_be_the_user():
    s, c, _ = _client_first_and_server()
    s = server(SHA256, {"alice": credential_from_password(SHA256, "pw", b"s" * 16)})
    with pytest.raises(AuthenticationFailed) as e:
        s.evaluate(b"n,a=bob,n=alice,r=abc")
    assert e.value.client_message == \
        "Authentication failed: Client requested an authorization id that is different from username"
    s = server(SHA256, {"alice": credential_from_password(SHA256, "pw", b"s" * 16)})
    assert s.evaluate(b"n,a=alice,n=alice,r=abc").startswith(b"r=abc")


def test_token_authentication_is_refused():
    s = server(SHA256, {"alice": credential_from_password(SHA256, "pw", b"s" * 16)})
    with pytest.raises(AuthenticationFailed, match="delegation tokens"):
        s.evaluate(b"n,,n=alice,r=abc,tokenauth=true")


@pytest.mark.parametrize("shapes", [{}, {scram.CredentialShape(64, 8192): 3}, {scram.CredentialShape(100, 4096): 1}])
def test_unknown_user_is_shown_what_stored_credentials_look_like(shapes):
    first = server(SHA512, {}, mock_shapes=shapes).evaluate(b"n,,n=nobody,r=abc").decode()
    salt, iterations = base64.b64decode(first.split(",")[1][2:]), int(first.split(",")[2][2:])
    (shape,) = shapes or {scram.DEFAULT_SHAPE: 1}
    assert (len(salt), iterations) == (shape.salt_length, shape.iterations)


def test_unknown_users_take_the_shapes_of_stored_credentials_in_their_proportions():
    common, rare = scram.CredentialShape(32, 4096), scram.CredentialShape(64, 8192)
    shown = [scram.mock_credential(SHA256, b"secret", f"user-{i}", {common: 3, rare: 1}) for i in range(2000)]
    share = sum((len(c.salt), c.iterations) == (32, 4096) for c in shown) / len(shown)
    assert 0.7 < share < 0.8
    assert {(len(c.salt), c.iterations) for c in shown} == {(32, 4096), (64, 8192)}
    assert len({c.salt for c in shown}) == 2000
    # the same name, the same answer: a real user's salt does not change between tries either
    assert scram.mock_credential(SHA256, b"secret", "user-7", {common: 3, rare: 1}) == shown[7]


@pytest.mark.parametrize("iterations", [1, 4095])
def test_client_refuses_fewer_iterations_than_kafka_allows_before_making_a_proof(iterations):
    c = ScramClient(SHA256, "alice", "pw", counter_bytes(), client_nonce="abc")
    with pytest.raises(scram.ScramClientError, match=f"Requested iterations {iterations} is less than the minimum "
                                                      "4096 for SCRAM-SHA-256"):
        c.final_message(f"r=abcdef,s=c2FsdA==,i={iterations}".encode())


def test_credential_below_minimum_iterations_is_refused():
    weak = credential_from_password(SHA256, "pw", b"s" * 16, 1000)
    with pytest.raises(AuthenticationFailed, match="less than the minimum 4096"):
        server(SHA256, {"alice": weak}).evaluate(b"n,,n=alice,r=abc")


def test_no_tokens_after_the_exchange():
    s, c, first = _client_first_and_server()
    s.evaluate(c.final_message(first))
    with pytest.raises(IllegalSaslState):
        s.evaluate(b"n,,n=alice,r=abc")


def test_name_escaping():
    assert scram.sasl_name("a=b,c") == "a=3Db=2Cc"
    assert scram.username_from_sasl_name("a=3Db=2Cc") == "a=b,c"
    for bad in ("a=b", "a=2", "=3"):
        with pytest.raises(ValueError):
            scram.username_from_sasl_name(bad)


def test_credential_repr_hides_keys():
    cred = credential_from_password(SHA256, "pw", b"secret-salt", 4096)
    assert "secret" not in repr(cred) and "4096" in repr(cred)
    assert cred.stored_key not in repr(cred).encode()


def test_salted_password_is_pbkdf2():
    import hashlib
    assert salted_password(SHA512, "pw", b"salt", 4096) == hashlib.pbkdf2_hmac("sha512", b"pw", b"salt", 4096)


# ------------------------------------------------------------------ --add-scram (Kafka's ScramParserTest)

def test_add_scram_password_and_defaults():
    a = parse_add_scram("SCRAM-SHA-256=[name=admin,password=admin-secret]", lambda n: b"\x01" * n)
    assert a.name == "admin" and a.mechanism is SHA256
    assert a.credential == credential_from_password(SHA256, "admin-secret", b"\x01" * 32, 4096)
    a = parse_add_scram(' SCRAM-SHA-512=[name=bob,password=my pass,iterations=8192,'
                        'salt="MWx2NHBkbnc0ZndxN25vdGN4bTB5eTFrN3E="] ', counter_bytes())
    assert a.credential.iterations == 8192 and a.credential.salt == b"1lv4pdnw4fwq7notcxm0yy1k7q"
    assert a.credential == credential_from_password(SHA512, "my pass", b"1lv4pdnw4fwq7notcxm0yy1k7q", 8192)


@pytest.mark.parametrize("arg, message", [
    ("SCRAM-SHA-512", "Failed to find equals sign in SCRAM argument 'SCRAM-SHA-512'"),
    ("SCRAM-SHA-UNSUPPORTED=[name=scram-admin,password=scram-user-secret]",
     "The add-scram mechanism SCRAM-SHA-UNSUPPORTED is not supported."),
    ("SCRAM-SHA-256=name=scram-admin,password=scram-user-secret]", "Expected configuration string to start with ["),
    ("SCRAM-SHA-256=[name=scram-admin,password=scram-user-secret", "Expected configuration string to end with ]"),
    ("SCRAM-SHA-256=[password=mypass]", "You must supply 'name' to add-scram"),
    ("SCRAM-SHA-256=[name=bar]", "You must supply one of 'password' or 'saltedpassword' to add-scram"),
    ("SCRAM-SHA-256=[name=bob,password=mypass,unknown=something,unknown2=somethingelse]",
     "Unknown SCRAM configurations: unknown, unknown2"),
    ('SCRAM-SHA-256=[name=alice,saltedpassword="mT0yyUUxnlJaC99HXgRTSYlbuqa4FSGtJCJfTMvjYCE="]',
     "You must supply 'salt' with 'saltedpassword' to add-scram"),
    ("SCRAM-SHA-256=[name]", "No equals sign found in SCRAM component: name"),
    ("SCRAM-SHA-256=[name=a,password=b,iterations=x]", "Failed to parse iterations count: x"),
    ("SCRAM-SHA-256=[name=a,password=b,iterations=4095]",
     "The 'iterations' value must be >= 4096 for add-scram using SCRAM-SHA-256"),
    ("SCRAM-SHA-512=[name=a,password=b,iterations=16385]",
     "The 'iterations' value must be <= 16384 for add-scram using SCRAM-SHA-512"),
    ("SCRAM-SHA-256=[name=a,password=b,salt=***]", "Failed to decode given salt: ***"),
])
def test_add_scram_errors(arg, message):
    with pytest.raises(AddScramError) as e:
        parse_add_scram(arg, counter_bytes())
    assert str(e.value) == message


def test_add_scram_list_in_a_properties_value():
    assert split_add_scram_list("SCRAM-SHA-256=[name=a,password=x], SCRAM-SHA-512=[name=a,password=x] "
                                "SCRAM-SHA-256=[name=b,password=y]") == [
        "SCRAM-SHA-256=[name=a,password=x]", "SCRAM-SHA-512=[name=a,password=x]", "SCRAM-SHA-256=[name=b,password=y]"]
    assert split_add_scram_list("  ") == []


# ------------------------------------------------------------------ PLAIN (Kafka's PlainSaslServerTest)

USERS = {"alice": "alice-secret", "bob": "bob-secret"}


def test_plain_success_with_and_without_authzid():
    for authzid in ("", "alice"):
        s = plain.PlainServer(USERS)
        assert s.evaluate(plain.client_token("alice", "alice-secret", authzid)) == b""
        assert s.complete and s.authorization_id == "alice"


@pytest.mark.parametrize("token, message", [
    (plain.client_token("alice", "bob-secret"), "Authentication failed: Invalid username or password"),
    (plain.client_token("carol", "bob-secret"), "Authentication failed: Invalid username or password"),
    (plain.client_token("alice", "alice-secret", "bob"),
     "Authentication failed: Client requested an authorization id that is different from username"),
    (plain.client_token("", "x"), "Authentication failed: username not specified"),
    (plain.client_token("alice", ""), "Authentication failed: password not specified"),
    (b"alice\0alice-secret", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
    (b"\0alice\0alice-secret\0", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
    (b"\0alice\0\xff", "Invalid SASL/PLAIN response: not UTF-8"),
])
def test_plain_failures_carry_kafkas_messages(token, message):
    s = plain.PlainServer(USERS)
    with pytest.raises(AuthenticationFailed) as e:
        s.evaluate(token)
    assert e.value.client_message == message and not s.complete


def test_plain_unknown_and_known_users_look_the_same_to_the_client():
    answers = []
    for user in ("alice", "nobody"):
        with pytest.raises(AuthenticationFailed) as e:
            plain.PlainServer(USERS).evaluate(plain.client_token(user, "wrong"))
        answers.append(e.value.client_message)
    assert answers[0] == answers[1]


def test_plain_users_from_a_callable_and_a_second_token_is_refused():
    s = plain.PlainServer(USERS.get)
    s.evaluate(plain.client_token("bob", "bob-secret"))
    with pytest.raises(IllegalSaslState):
        s.evaluate(plain.client_token("bob", "bob-secret"))
