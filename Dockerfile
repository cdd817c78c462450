# minivlm on a Docker Space (or any Docker host): python app.py on port 7860 as the Spaces user (uid 1000).
FROM python:3.11-slim

# a CJK font (Noto Sans CJK), so a browser on this machine draws the Chinese page and plots without boxes; a C
# compiler with OpenMP (gcc pulls libgomp1 and omp.h; libc6-dev has the C headers, only recommended by gcc), so the
# CPU backend's kernels build on first start (minivlm/model/backends/cpu_kernels/README.md) and the app runs what
# bench/ measured. The Space without Docker installs the same from packages.txt.
RUN apt-get update && apt-get install -y --no-install-recommends fonts-noto-cjk gcc libc6-dev libgomp1 \
    && rm -rf /var/lib/apt/lists/*
RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860
WORKDIR $HOME/app

COPY --chown=user requirements.txt .
RUN pip install --no-cache-dir --user -r requirements.txt

COPY --chown=user . .
EXPOSE 7860
CMD ["python", "app.py"]
