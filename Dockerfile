# mxtrain as an Amazon SageMaker training image (docs/sagemaker.md).
#
#   docker build -t mxtrain .                                  # CUDA 13 devel base (default)
#   docker build --build-arg BASE_IMAGE=<AWS DLC image URI> -t mxtrain .   # an AWS Deep Learning
#                                                              # Container base instead
#
# SageMaker runs the image as `docker run IMAGE train`: the exec-form ENTRYPOINT below makes that
# `mxtrain sagemaker train` as PID 1, so StopTrainingJob's / a spot reclaim's SIGTERM reaches
# mxtrain itself (no shell in between), which checkpoints at the next step boundary. Nothing is
# stored under /opt/ml: SageMaker mounts the job's inputs there at run time.
ARG BASE_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04
FROM ${BASE_IMAGE}

# GPU architectures for the CUDA backend (sm_90 Hopper, sm_100 Blackwell B200/B300), used once
# the build has MXTRAIN_CUDA; `-march` for the CPU code: a baseline every instance type runs,
# not the build machine's own CPU (use armv8.2-a or similar on Graviton / Grace).
ARG CUDA_ARCHS="90;100"
ARG MXTRAIN_CUDA=ON
ARG CPU_ARCH=x86-64-v3

ENV DEBIAN_FRONTEND=noninteractive
# bash with pipefail for the RUN steps: a failing command inside a pipe fails the step.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The Debian/Ubuntu packages scripts/setup.sh installs, plus sshd for multi-node jobs. Not
# pinned to versions: the same list must install on the CUDA base and on a DLC base.
# `apt-get clean`: a base without the official images' docker-clean apt hook (a Debian root
# made with debootstrap, docs/sagemaker.md) would otherwise keep every downloaded .deb in
# the image (300 MB).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        build-essential cmake pkg-config libopenblas-openmp-dev libopenmpi-dev openmpi-bin \
        nlohmann-json3-dev libtoml11-dev libcli11-dev libgtest-dev libcurl4-openssl-dev \
        libssl-dev fortunes python3-matplotlib ccache python3-pip \
        openssh-server openssh-client ca-certificates \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*

# Multi-node: the first host starts mpirun over ssh on the others (as root, with one key that
# every container of this image shares; the hosts of a job talk over its private network only).
RUN mkdir -p /run/sshd /root/.ssh \
    && ssh-keygen -A \
    && ssh-keygen -q -t ed25519 -N "" -f /root/.ssh/id_ed25519 \
    && cat /root/.ssh/id_ed25519.pub >> /root/.ssh/authorized_keys \
    && chmod 700 /root/.ssh && chmod 600 /root/.ssh/authorized_keys \
    && printf 'Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' \
        > /root/.ssh/config

# mxtrain itself, Release, and the bundled demo corpus (the default data when a job has no
# `train` channel). -DCMAKE_CUDA_ARCHITECTURES / -DMXTRAIN_CUDA are ignored by a build without
# the CUDA backend (CMake notes them as unused).
COPY . /opt/mxtrain
WORKDIR /opt/mxtrain
# CMake >= 3.25 (Ubuntu 22.04 based DLC images have 3.22): from PyPI when the base's is older.
RUN if ! cmake --version | awk 'NR==1 { split($3, v, "."); exit !(v[1] > 3 || (v[1] == 3 && v[2] >= 25)) }'; then \
        python3 -m pip install --no-cache-dir "cmake>=3.25,<4"; \
    fi
# The CUDA backend's attention on cuDNN's fused SDPA is compiled against the header-only
# cudnn-frontend (pinned, sha256-checked, from its PyPI wheel by `pip download`; libcudnn itself
# comes with the cudnn base image and is opened at run time). Without the headers the image
# would train with the slow fp32 attention kernel, so a failed fetch fails the build. A base
# without nvcc (the CPU variant) skips it.
RUN scripts/fetch_cudnn_frontend.sh
# With nvcc in the base the CUDA backend must come out of the build: without NCCL CMake falls
# back to the CPU engine alone (a warning), which here would be a GPU image that cannot use
# its GPUs.
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMXTRAIN_TESTS=OFF \
        -DMXTRAIN_CPU_ARCH="${CPU_ARCH}" -DMXTRAIN_CUDA="${MXTRAIN_CUDA}" \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS}" \
    && cmake --build build -j"$(nproc)" \
    && if [ "${MXTRAIN_CUDA}" = ON ] && command -v nvcc >/dev/null && [ ! -f build/libmxcuda.so ]; then \
        echo "error: nvcc is in the image but the CUDA backend was not built (no NCCL? see the" \
             "cmake warning above): this image would train on the CPU only" >&2; exit 1; \
    fi \
    && scripts/make_corpus.sh build/corpus.txt

ENV PATH=/opt/mxtrain/build:${PATH} \
    OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

ENTRYPOINT ["/opt/mxtrain/build/mxtrain", "sagemaker"]
