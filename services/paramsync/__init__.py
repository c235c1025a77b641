"""Paramsync: versioned weight broadcast from the trainer to every rollout replica.

The trainer publishes each policy version once (:class:`services.paramsync.client.ParamSyncClient`);
paramsync checks it, keeps the last ``K`` versions and delivers them to every replica through
one of the transports in :mod:`services.paramsync.transports`.
"""
