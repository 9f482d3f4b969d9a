"""Stand-in for vllm_omni/distributed/omni_connectors/__init__.py
(vllm-project/vllm-omni@0342827dd787296b8a6b1e9f523ebaa24d13c714): it exports
``OmniConnectorFactory``, ``ConnectorSpec`` and ``SharedMemoryConnector``."""

from vllm_omni import _toy
from vllm_omni.distributed.omni_connectors.connectors.shm_connector import SharedMemoryConnector
from vllm_omni.distributed.omni_connectors.factory import OmniConnectorFactory
from vllm_omni.distributed.omni_connectors.utils.config import ConnectorSpec

__all__ = ["ConnectorSpec", "OmniConnectorFactory", "SharedMemoryConnector"]

_toy.drop_interfaces(globals(), __name__)
