-- The capture user of the compose stack: replication and read access only.
CREATE USER IF NOT EXISTS 'sluice'@'%' IDENTIFIED BY 'sluice';
GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'sluice'@'%';
