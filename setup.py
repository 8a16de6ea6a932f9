from setuptools import find_packages, setup

setup(
    name="robotserve_ros",
    version="0.1.0",
    description="Execution-aware serving of physical-AI models to robot fleets (ROS 2 node suite)",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["robotserve_ros", "robotserve_ros.*"]),
    # Data the code reads at run time: the measured workloads (sim/workloads.py MEASURED) and
    # the engine profiles of record (robotserve_ros/profiles).
    package_data={"robotserve_ros.sim": ["measured/*.json"], "robotserve_ros.profiles": ["*.json"],
                  "robotserve_ros.timely": ["skill_times.json"],  # the LLM planner's per-skill time model
                  # the fake LeRobot robot plugin (tests and `bench mixed-fleet`)
                  "robotserve_ros.live": ["lerobot_plugins/*.py", "lerobot_plugins/*/*"]},
    install_requires=[
        "numpy>=1.24", "matplotlib>=3.7", "tqdm>=4.60", "PyYAML>=6",
        "grpcio>=1.85.1,<2", "protobuf>=7.35.1,<8",  # the remote GPU server (transport/)
        "msgpack>=1.0,<2", "websockets>=15,<16",  # the openpi endpoint (transport/openpi/)
        # compressed camera frames (transport/images.py): OpenCV decodes, Pillow reads headers
        "opencv-python-headless>=4.11,<4.13", "pillow>=10",
        "prometheus-client>=0.20,<1",  # the inference server's metrics endpoint (serve/metrics.py)
        "pyzmq>=26,<28", "msgspec>=0.19,<1",  # the engine core in its own process (serve/core_process.py)
    ],
    # openpi's client for tests and `bench openpi`: the Makefile installs it --no-deps (it pins numpy<2).
    extras_require={"test": ["pytest>=7", "hypothesis>=6", "py-spy==0.4.3"],  # py-spy: bench fleet-live --flame
                    # the `ray` tier (transport/ray_pool.py): a Ray Serve pool of policy replicas
                    "ray": ["ray[serve]==2.60.0"],
                    "openpi": ["dm-tree", "pillow", "typing_extensions"]},
    entry_points={"console_scripts": ["robotserve = robotserve_ros.cli:main"]},
)
