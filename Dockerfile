# One image for every vflsec service (coordinator, active, passive) and for the one-shot jobs.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1

# PSI's ristretto255 is the system's libsodium (pysodium binds it through ctypes).
RUN apt-get update && apt-get install -y --no-install-recommends libsodium23 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 vflsec
WORKDIR /app

# torch first, pinned, CPU build: anything else pulls GBs of CUDA.
RUN pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY proto proto
COPY services services
COPY client client
RUN pip install .

# Named volumes are initialised from these folders, so they belong to the unprivileged user.
RUN mkdir /federation /state && chown vflsec:vflsec /federation /state
USER vflsec
ENTRYPOINT ["vflsec"]
