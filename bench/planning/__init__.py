"""Planning without a GPU: placement (membench greedy, torchrec adapter), peak estimate, calibration, provisioning."""
