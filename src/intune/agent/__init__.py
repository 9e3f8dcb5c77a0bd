"""The InTune agent: a branching Q-network over per-knob moves, pretrained in the simulator.

``policy`` (``IntunePolicy``, the registry's ``intune``) runs the network under the ``SafetyLayer``;
``features`` turns an Observation into the network's input; ``network`` holds the model and
``online_learning`` its online DQN step (numpy); ``dqn``, ``replay``, ``imitation``, ``teacher`` and ``env`` train it
(``env`` wraps the simulator); ``pretrain`` is the ``intune pretrain`` command and ``evaluate`` the
episodes ``intune bench agent`` scores; ``config`` holds every hyperparameter; ``weights/`` the
shipped network. Import the submodules (torch is loaded by those that need it); it must not import
``intune.bench``.
"""
