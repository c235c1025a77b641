"""The private redis-server used by the local stack and the tests."""

import redis

from relayrl.redis_process import RedisProcess


def test_aof_always_survives_a_crash(tmp_path):
    server = RedisProcess(data_dir=tmp_path, appendfsync="always").start()
    try:
        redis.Redis.from_url(server.url).xadd("s", {"k": "v"})
        server.kill()
        server.start()
        assert redis.Redis.from_url(server.url).xlen("s") == 1
    finally:
        server.stop()


def test_password_is_required_when_set(tmp_path):
    server = RedisProcess(data_dir=tmp_path, password="pw").start()
    try:
        assert redis.Redis.from_url(server.url).ping()
        anonymous = redis.Redis(host=server.host, port=server.port)
        try:
            anonymous.set("x", 1)
        except redis.AuthenticationError:
            pass
        except redis.ResponseError as err:
            assert "NOAUTH" in str(err)
        else:
            raise AssertionError("redis accepted a client without the password")
    finally:
        server.stop()
