"""`embedlab.data.criteo_dask` is `embedlab.data.criteo.etl_dask`: the Criteo ETL on a Dask cluster."""
import sys

from .criteo import etl_dask

sys.modules[__name__] = etl_dask
