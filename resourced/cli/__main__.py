from resourced.gpuctl import entry

entry()
