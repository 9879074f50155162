from ..gpuctl import entry

entry()
