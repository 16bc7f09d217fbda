"""embedlab.services: helpers that start and stop the outside servers the systems talk to.

* :mod:`embedlab.services.redis_server`: the Redis of the HPS's volatile tier: the user's own
  (``EMBEDLAB_REDIS_ADDRESS`` / ``EMBEDLAB_REDIS_PASSWORD``, never stopped or killed here), or
  local password-protected ``redis-server`` processes on 127.0.0.1 (one node or a cluster) that
  die with their owner. The Redis client tier itself is :class:`embedlab.hps.tiers.RedisTier`.
* :mod:`embedlab.services.children`: how every child server is tied to its owner (a
  parent-death signal and an owner marker) and how stale ones are found and reported.

Example:
    >>> from embedlab.services import start_redis
    >>> r = start_redis()
    >>> r.address.startswith("127.0.0.1:") and r.ping()
    True
    >>> r.stop()
"""
from .redis_server import (ADDRESS_ENV, PASSWORD_ENV, ExternalRedis, RedisCluster, RedisServer, RedisSettingError,
                           hps_redis, redis_binaries, redis_to_kill, report_stale_redis, start_redis,
                           start_redis_cluster)

__all__ = ["RedisServer", "RedisCluster", "ExternalRedis", "RedisSettingError", "hps_redis", "redis_to_kill",
           "report_stale_redis", "start_redis", "start_redis_cluster", "redis_binaries", "ADDRESS_ENV", "PASSWORD_ENV"]
