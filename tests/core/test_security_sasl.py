"""A connection's SASL state machine, modelled on Kafka's SaslAuthenticatorTest and
SaslServerAuthenticator: what may arrive when, what is answered, when the connection closes,
and KIP-368 re-authentication with the clock passed in."""
import itertools

import pytest
from tests.tiers import examples

from oncelog.core.security import plain
from oncelog.core.security.principal import KafkaPrincipal
from oncelog.core.security.sasl import SASL_SERVER_MAX_RECEIVE_SIZE, Route, SaslSession, SaslState
from oncelog.core.security.scram import ScramClient, ScramMechanism, ScramServer, credential_from_password
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

SHA256 = ScramMechanism.SCRAM_SHA_256
PLAIN_USERS = {"alice": "alice-secret", "bob": "bob-secret"}
CREDS = {"alice": credential_from_password(SHA256, "alice-secret", b"s" * 16),
         "bob": credential_from_password(SHA256, "bob-secret", b"t" * 16)}
GENERIC = "Authentication failed during authentication due to invalid credentials with SASL mechanism "


def random_bytes():
    c = itertools.count()
    return lambda n: bytes((next(c) * 7 + i) % 256 for i in range(n))


def new_server(mechanism):
    if mechanism == "PLAIN":
        return plain.PlainServer(PLAIN_USERS)
    return ScramServer(ScramMechanism.from_name(mechanism), CREDS.get, random_bytes(), b"secret")


def session(mechanisms=("PLAIN", "SCRAM-SHA-256"), reauth_ms=0):
    return SaslSession(mechanisms, new_server, max_reauth_ms=reauth_ms)


def plain_login(s, user="alice", password="alice-secret", now=0, handshake_version=1, auth_version=2):
    assert s.route(ApiKey.SASL_HANDSHAKE, handshake_version, now).route is Route.HANDSHAKE
    assert s.handshake(handshake_version, "PLAIN").error_code == ErrorCode.NONE
    token = plain.client_token(user, password)
    if handshake_version == 0:
        assert s.expects_raw_token
        return s.raw_token(token, now)
    assert s.route(ApiKey.SASL_AUTHENTICATE, auth_version, now).route is Route.AUTHENTICATE
    return s.authenticate(auth_version, token, now)


def scram_login(s, user="alice", password="alice-secret", now=0, auth_version=2):
    assert s.route(ApiKey.SASL_HANDSHAKE, 1, now).route is Route.HANDSHAKE
    assert s.handshake(1, "SCRAM-SHA-256").error_code == ErrorCode.NONE
    c = ScramClient(SHA256, user, password, random_bytes())
    assert s.route(ApiKey.SASL_AUTHENTICATE, auth_version, now).route is Route.AUTHENTICATE
    first = s.authenticate(auth_version, c.first_message(), now)
    assert first.error_code == ErrorCode.NONE and first.session_lifetime_ms == 0 and not s.authenticated
    assert s.route(ApiKey.SASL_AUTHENTICATE, auth_version, now).route is Route.AUTHENTICATE
    final = s.authenticate(auth_version, c.final_message(first.auth_bytes), now)
    if final.error_code == ErrorCode.NONE:
        c.verify_server_final(final.auth_bytes)
    return final


# ------------------------------------------------------------------ the happy paths

@pytest.mark.parametrize("auth_version", [0, 1, 2])
def test_plain_over_sasl_authenticate(auth_version):
    s = session()
    answer = plain_login(s, auth_version=auth_version)
    assert answer.error_code == ErrorCode.NONE and answer.auth_bytes == b"" and not answer.close_after
    assert s.authenticated and s.principal == KafkaPrincipal.user("alice") and s.mechanism == "PLAIN"
    assert s.route(ApiKey.PRODUCE, 9, 0).route is Route.REQUEST
    assert s.receive_limit is None


def test_scram_over_sasl_authenticate():
    s = session()
    assert scram_login(s).error_code == ErrorCode.NONE
    assert s.authenticated and s.principal == KafkaPrincipal.user("alice")


def test_api_versions_then_handshake():
    s = session()
    assert s.route(ApiKey.API_VERSIONS, 3, 0).route is Route.API_VERSIONS
    s.api_versions_answered(valid=True)
    assert s.state is SaslState.HANDSHAKE_ONLY
    assert plain_login(s).error_code == ErrorCode.NONE


def test_unsupported_api_versions_version_may_be_retried():
    s = session()
    assert s.route(ApiKey.API_VERSIONS, 99, 0).route is Route.API_VERSIONS
    s.api_versions_answered(valid=False)           # answered UNSUPPORTED_VERSION; the client retries v0
    assert s.route(ApiKey.API_VERSIONS, 0, 0).route is Route.API_VERSIONS


def test_v0_handshake_then_raw_tokens_like_kafka_python_2_0():
    s = session()
    answer = plain_login(s, handshake_version=0)
    assert answer.error_code == ErrorCode.NONE and answer.auth_bytes == b""   # sent as four zero bytes
    assert s.authenticated and not s.expects_raw_token


def test_v0_handshake_with_scram_exchanges_raw_tokens():
    s = session()
    assert s.route(ApiKey.SASL_HANDSHAKE, 0, 0).route is Route.HANDSHAKE
    s.handshake(0, "SCRAM-SHA-256")
    c = ScramClient(SHA256, "bob", "bob-secret", random_bytes())
    first = s.raw_token(c.first_message(), 0)
    assert s.expects_raw_token
    final = s.raw_token(c.final_message(first.auth_bytes), 0)
    c.verify_server_final(final.auth_bytes)
    assert s.authenticated and s.principal == KafkaPrincipal.user("bob")


# ------------------------------------------------------------------ what is refused, and how

@pytest.mark.parametrize("api_key", [ApiKey.PRODUCE, ApiKey.METADATA, ApiKey.SASL_AUTHENTICATE, 12345])
def test_requests_before_the_handshake_close_without_answer(api_key):
    s = session()
    r = s.route(api_key, 0, 0)
    assert r.route is Route.CLOSE and "during SASL handshake" in r.reason
    assert s.state is SaslState.FAILED


def test_second_api_versions_closes():
    s = session()
    s.route(ApiKey.API_VERSIONS, 3, 0)
    s.api_versions_answered(True)
    assert s.route(ApiKey.API_VERSIONS, 3, 0).route is Route.CLOSE


def test_handshake_versions_above_1_are_refused():
    assert session().route(ApiKey.SASL_HANDSHAKE, 2, 0).route is Route.CLOSE


def test_unknown_mechanism_answers_33_with_the_list_then_closes():
    s = session()
    s.route(ApiKey.SASL_HANDSHAKE, 1, 0)
    answer = s.handshake(1, "GSSAPI")
    assert answer.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert answer.mechanisms == ("PLAIN", "SCRAM-SHA-256") and answer.close_after
    assert s.route(ApiKey.SASL_AUTHENTICATE, 2, 0).route is Route.CLOSE


def test_other_requests_during_authentication_get_illegal_sasl_state_then_close():
    s = session()
    s.route(ApiKey.SASL_HANDSHAKE, 1, 0)
    s.handshake(1, "PLAIN")
    r = s.route(ApiKey.METADATA, 12, 0)
    assert r.route is Route.REFUSE_AND_CLOSE and "during SASL authentication" in r.reason


def test_unsupported_sasl_authenticate_version_closes():
    s = session()
    s.route(ApiKey.SASL_HANDSHAKE, 1, 0)
    s.handshake(1, "PLAIN")
    assert s.route(ApiKey.SASL_AUTHENTICATE, 3, 0).route is Route.CLOSE


@pytest.mark.parametrize("login, mechanism", [(plain_login, "PLAIN"), (scram_login, "SCRAM-SHA-256")])
def test_wrong_password_answers_58_then_closes(login, mechanism):
    s = session()
    answer = login(s, password="wrong")
    assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED and answer.close_after
    assert answer.failure is not None and answer.failure.user == "alice"
    if mechanism == "PLAIN":
        assert answer.error_message == "Authentication failed: Invalid username or password"
    else:
        assert answer.error_message == GENERIC + mechanism
    assert answer.auth_bytes == b""
    assert s.state is SaslState.FAILED and s.route(ApiKey.METADATA, 1, 0).route is Route.CLOSE


def test_unknown_user_gets_the_same_answer_as_a_wrong_password():
    known, unknown = session(), session()
    a, b = scram_login(known, password="wrong"), scram_login(unknown, user="mallory", password="wrong")
    assert (a.error_code, a.error_message) == (b.error_code, b.error_message)
    a, b = plain_login(session(), password="wrong"), plain_login(session(), user="mallory", password="wrong")
    assert (a.error_code, a.error_message) == (b.error_code, b.error_message)


def test_v0_failure_closes_without_an_answer():
    answer = plain_login(session(), password="wrong", handshake_version=0)
    assert answer.auth_bytes is None and answer.close_after and answer.failure is not None


def test_sasl_requests_after_authentication_get_illegal_sasl_state_and_keep_the_connection():
    s = session()
    plain_login(s)
    assert s.route(ApiKey.SASL_AUTHENTICATE, 2, 0).route is Route.REFUSE
    assert s.route(ApiKey.SASL_HANDSHAKE, 1, 0).route is Route.REFUSE    # re-authentication is off
    assert s.route(ApiKey.FETCH, 12, 0).route is Route.REQUEST


def test_frames_before_authentication_are_capped():
    s = session()
    assert s.receive_limit == SASL_SERVER_MAX_RECEIVE_SIZE
    plain_login(s)
    assert s.receive_limit is None


def test_a_session_needs_mechanisms():
    with pytest.raises(ValueError):
        SaslSession((), new_server)


# ------------------------------------------------------------------ KIP-368

def test_session_lifetime_and_expiry():
    s = session(reauth_ms=60_000)
    answer = plain_login(s, now=1000)
    assert answer.session_lifetime_ms == 60_000 and s.expiry_ms == 61_000
    assert s.route(ApiKey.PRODUCE, 9, 61_000).route is Route.REQUEST
    r = s.route(ApiKey.PRODUCE, 9, 61_001)
    assert r.route is Route.CLOSE and "expired" in r.reason


def test_v0_sasl_authenticate_gets_no_lifetime_but_the_session_still_expires():
    s = session(reauth_ms=5_000)
    answer = plain_login(s, auth_version=0, now=0)
    assert answer.session_lifetime_ms == 5_000       # the v0 response simply has no such field
    assert s.route(ApiKey.SASL_HANDSHAKE, 1, 2_000).route is Route.REFUSE   # client never showed v1+
    assert s.route(ApiKey.METADATA, 12, 5_001).route is Route.CLOSE


def test_reauthentication_renews_the_session():
    s = session(reauth_ms=10_000)
    scram_login(s, now=0)
    assert s.route(ApiKey.SASL_HANDSHAKE, 1, 9_000).route is Route.HANDSHAKE
    assert s.reauthenticating and not s.authenticated
    s.handshake(1, "SCRAM-SHA-256")
    assert s.route(ApiKey.PRODUCE, 9, 9_000).route is Route.REFUSE_AND_CLOSE   # nothing else meanwhile


def test_reauthentication_completes_with_the_same_principal():
    s = session(reauth_ms=10_000)
    scram_login(s, now=0)
    answer = scram_login(s, now=9_000)
    assert answer.error_code == ErrorCode.NONE and answer.session_lifetime_ms == 10_000
    assert s.authenticated and s.expiry_ms == 19_000 and not s.reauthenticating
    assert s.route(ApiKey.PRODUCE, 9, 18_000).route is Route.REQUEST


def test_reauthentication_after_expiry_is_still_allowed():
    s = session(reauth_ms=1_000)
    plain_login(s, now=0)
    assert plain_login(s, now=5_000).error_code == ErrorCode.NONE
    assert s.expiry_ms == 6_000


def test_reauthentication_at_most_once_a_second():
    s = session(reauth_ms=60_000)
    plain_login(s, now=0)
    plain_login(s, now=1_000)
    assert s.route(ApiKey.SASL_HANDSHAKE, 1, 1_999).route is Route.REFUSE
    assert plain_login(s, now=2_000).error_code == ErrorCode.NONE


def test_reauthentication_may_not_change_the_principal():
    s = session(reauth_ms=60_000)
    plain_login(s, now=0)
    answer = plain_login(s, user="bob", password="bob-secret", now=2_000)
    assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED and answer.close_after
    assert answer.error_message == "Cannot change principals during re-authentication from User.alice: User.bob"


def test_reauthentication_may_not_change_the_mechanism():
    s = session(reauth_ms=60_000)
    plain_login(s, now=0)
    assert s.route(ApiKey.SASL_HANDSHAKE, 1, 2_000).route is Route.HANDSHAKE
    assert s.handshake(1, "SCRAM-SHA-256").error_code == ErrorCode.NONE     # Kafka answers, then fails
    r = s.route(ApiKey.SASL_AUTHENTICATE, 2, 2_000)
    assert r.route is Route.CLOSE and "not supported for re-authentication of mechanism 'PLAIN'" in r.reason


def test_failed_reauthentication_uses_the_reauthentication_text():
    s = session(reauth_ms=60_000)
    scram_login(s, now=0)
    answer = scram_login(s, password="wrong", now=2_000)
    assert answer.error_message == ("Authentication failed during re-authentication due to invalid credentials "
                                    "with SASL mechanism SCRAM-SHA-256")


def test_calls_out_of_order_are_programming_errors():
    s = session()
    with pytest.raises(RuntimeError):
        s.authenticate(2, b"x", 0)


# ------------------------------------------------------------------ fuzzing

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from oncelog.core.security.sasl import AuthenticationFailed  # noqa: E402

GOOD_TOKENS = {plain.client_token("alice", "alice-secret"): "alice", plain.client_token("", "x"): None,
               b"n,,n=alice,r=abc": None, b"c=biws,r=abc,p=AAAA": None}
# biased towards what a client would send next, so that exchanges get far enough to matter
tokens = st.one_of(st.sampled_from(sorted(GOOD_TOKENS)),
                   st.builds(lambda t, i, b: t[:i] + bytes([b]) + t[i + 1:], st.sampled_from(sorted(GOOD_TOKENS)),
                             st.integers(0, 24), st.integers(0, 255)),
                   st.binary(max_size=64))
frames = st.tuples(st.sampled_from([ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_HANDSHAKE,
                                    ApiKey.SASL_AUTHENTICATE, ApiKey.SASL_AUTHENTICATE, ApiKey.SASL_AUTHENTICATE,
                                    ApiKey.METADATA, 7777]),
                   st.sampled_from([1, 1, 2, 0, 3, -1]), tokens,
                   st.sampled_from(["PLAIN", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", ""]),
                   st.booleans(), st.integers(0, 3000))


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frames, max_size=16), st.sampled_from([0, 1000]))
def test_any_frame_sequence_is_answered_by_the_rules(events, reauth_ms):
    """Whatever arrives, the session only ever routes, answers or closes; it authenticates only
    after a valid exchange, and never after it failed."""
    s = session(reauth_ms=reauth_ms)
    now, valid_users = 0, set()
    for api_key, version, token, mechanism, flag, dt in events:
        now += dt
        if s.expects_raw_token:
            answer = s.raw_token(token, now)
        else:
            routing = s.route(api_key, version, now)
            r = routing.route
            if r in (Route.CLOSE, Route.REFUSE_AND_CLOSE):
                assert routing.reason
                break
            if r is Route.API_VERSIONS:
                s.api_versions_answered(flag)
                continue
            if r is Route.HANDSHAKE:
                answer = s.handshake(version, mechanism)
                assert (answer.error_code == ErrorCode.NONE) is (mechanism in s.mechanisms)
                if answer.close_after:
                    break
                continue
            if r in (Route.REQUEST, Route.REFUSE):
                assert s.authenticated
                continue
            answer = s.authenticate(version, token, now)
        if GOOD_TOKENS.get(token) and answer.error_code == ErrorCode.NONE:
            valid_users.add(GOOD_TOKENS[token])
        if answer.close_after:
            assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert isinstance(answer.failure, AuthenticationFailed) and s.state is SaslState.FAILED
            break
    if s.authenticated:
        assert s.principal.name in valid_users


@settings(max_examples=examples(500), deadline=None)
@given(st.lists(st.binary(max_size=200) | st.text(max_size=120).map(str.encode), min_size=1, max_size=3))
def test_scram_server_only_ever_fails_cleanly(messages):
    s = ScramServer(SHA256, CREDS.get, random_bytes(), b"secret")
    for m in messages:
        try:
            s.evaluate(m)
        except AuthenticationFailed:
            return
        except Exception as e:   # noqa: BLE001 -- the point of the test
            from oncelog.core.security.sasl import IllegalSaslState
            assert isinstance(e, IllegalSaslState) and s.complete, e
            return
    assert not s.complete
