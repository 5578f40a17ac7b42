# Image for Cascade's jobs (training today; the gateway will use the same image).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY pipelines ./pipelines
COPY services ./services
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -e . \
 && pip install --no-cache-dir --no-deps recbole==1.2.1
VOLUME ["/artifacts"]
ENTRYPOINT ["cascade"]
CMD ["train", "--workdir", "/artifacts/work", "--output", "/artifacts"]
